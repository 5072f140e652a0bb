"""The command line: `python -m minillm generate | chat | serve | bench`."""
