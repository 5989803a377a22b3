"""File data: the blocks of a read found in the data layer, the disk layer or the backend
(:mod:`.datapath`), sequential read-ahead (:mod:`.prefetch`) and checksum verification of
whole-file reads (:mod:`.integrity`).

May import: the top-level modules, :mod:`rucio_fs.observe` and :mod:`rucio_fs.cache`.
"""
