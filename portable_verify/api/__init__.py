"""The front doors: padded ``verify`` and ragged ``verify_ragged``, over one shared tail."""
