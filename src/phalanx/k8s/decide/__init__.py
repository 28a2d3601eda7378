"""The decide side: a world -> the core's decisions and the forecasts they quote, one way for every caller."""
