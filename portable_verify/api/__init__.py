"""The four front doors (``verify``, ``verify_ragged``, ``verify_rows``, ``verify_tree``)."""
