from kvbounds.cli import main

raise SystemExit(main())
