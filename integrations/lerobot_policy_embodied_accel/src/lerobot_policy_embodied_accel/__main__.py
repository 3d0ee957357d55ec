from .wrap import main

raise SystemExit(main())
