"""The registered conformance checks (one module per family, listed in ``kit.CHECK_MODULES``)
and the comparison machinery they share (``reference_comparison``, ``near_boundary``)."""
