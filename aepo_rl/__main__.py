from aepo_rl.cli import main

raise SystemExit(main())
