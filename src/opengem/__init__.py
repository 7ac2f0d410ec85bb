"""opengem: a GEM-style ads recommendation foundation model."""

__version__ = "0.1.0"
