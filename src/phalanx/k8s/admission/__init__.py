"""The admission server (`phalanx webhook`): the GPU-share and dataset mutation, served over HTTPS."""
