"""rucio-fs: mount data catalogs (Rucio, iRODS, S3, ...) as ordinary directories."""

__version__ = "0.1.0"
