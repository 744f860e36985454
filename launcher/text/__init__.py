"""Pure text helpers every layer may use (issue 35 item 5): they import nothing of dtrain.

    words.py     numbers in words: ``count`` (``3 nodes``), ``rank_ranges`` (``0-3,6``)
    redact.py    secret-looking environment values hidden before anything shows or keeps them
    termsafe.py  remote text made inert on a terminal (colours pass, other controls do not)

They sit low so that ``decide/`` and ``transports/`` need nothing from ``output/``
(tests/test_layers.py keeps it so).
"""
