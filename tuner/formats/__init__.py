"""Host-side layout builders, one module per layout: vectorised NumPy, no GPU."""
