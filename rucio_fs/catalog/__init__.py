"""The one door to the backend (:mod:`.catalog`): the namespace caches and every backend
call of a mount, and the tier many mounts share in Redis (:mod:`.shared`).

May import: the top-level modules, :mod:`rucio_fs.observe`, :mod:`rucio_fs.cache` and
:mod:`rucio_fs.data`.
"""
