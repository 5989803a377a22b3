"""The ``rucio-fs`` command (:mod:`.commands`), the mount's lifecycle (:mod:`.daemon`), the
mount helper for fstab (:mod:`.fstab`) and ``rucio-fs warm`` on both sides
(:mod:`.warm_client`, :mod:`.warm`).

May import: everything.
"""
