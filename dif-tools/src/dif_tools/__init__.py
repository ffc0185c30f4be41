"""dif-tools: the `dif` command line (see `dif_tools.cli`)."""

__version__ = "0.1.0"
