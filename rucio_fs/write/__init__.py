"""Writing: files staged on local disk (:mod:`.writeback`, small ones in the slots of
:mod:`.arena`), the crash-safe journal of what the mount owes the server (:mod:`.journal`),
and the queue that carries it out with async write-back (:mod:`.write_queue`).

May import: the top-level modules, :mod:`rucio_fs.observe`, :mod:`rucio_fs.cache`,
:mod:`rucio_fs.data` and :mod:`rucio_fs.catalog`.
"""
