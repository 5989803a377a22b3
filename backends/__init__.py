"""Built-in backends, installed as ``rucio_fs.backends``. Each registers itself under the
``rucio_fs.backends`` entry-point group in pyproject.toml, exactly as a plugin would."""
