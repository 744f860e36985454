from __future__ import annotations

try:  # Ctrl-C between runpy and the CLI's own guards: 130, no traceback (docs/reliability.md)
    from launcher.cli import main
except KeyboardInterrupt:
    from launcher.errors import interrupt_handled

    interrupt_handled()
    raise SystemExit(130) from None

main()
