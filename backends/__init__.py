"""Built-in backends, installed as ``rucio_fs.backends``: one package per URL scheme, each
registered under the ``rucio_fs.backends`` entry-point group in pyproject.toml exactly as a
third-party plugin would be. ``memory`` is the reference: the smallest complete writable
backend, the one to copy when writing a plugin."""
