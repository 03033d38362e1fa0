"""One module per CLI command; minfer/cli.py registers them."""
