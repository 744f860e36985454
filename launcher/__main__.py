from __future__ import annotations

try:  # Ctrl-C between runpy and the CLI's own guards: 130, no traceback (docs/reliability.md)
    from launcher.start import main
except KeyboardInterrupt:
    from launcher.errors import interrupt_handled
    from launcher.exitcodes import EXIT_INTERRUPTED

    interrupt_handled()
    raise SystemExit(EXIT_INTERRUPTED) from None

main()
