import sys

from aggregator.main import main

sys.exit(main())
