import sys

from launcher.runtime.runner import main

sys.exit(main())
