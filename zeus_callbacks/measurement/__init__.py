"""Power sampling and window energy attribution."""
