"""Reports: metrics CSV, plots and an HTML page from simulation experiments."""
