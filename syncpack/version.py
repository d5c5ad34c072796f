"""The one version number of syncpack: pyproject.toml reads it, ``--version`` prints it."""

VERSION = "0.3.0"
