import sys

from deploy.stack.cli import main

sys.exit(main())
