"""The FUSE glue: pyfuse3 operations translated onto the catalog and the write-back
(:mod:`.fs`), inode numbers and the kernel's lookup counts (:mod:`.inodes`), and the kernel
settings of a mount (:mod:`.kernel_tuning`). Nothing below this package imports pyfuse3.

May import: every package but :mod:`rucio_fs.cli`.
"""
