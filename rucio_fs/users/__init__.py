"""One mount, many users (``--identity per-user``): a catalog per local user and
credential (:mod:`.identities`) and a site's identity map (:mod:`.identity_map`).

May import: the top-level modules and the packages below :mod:`rucio_fs.write`.
"""
