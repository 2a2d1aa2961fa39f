from cdclake_control.cli import main

raise SystemExit(main())
