import sys

from torch_mojo.bench.sweep import main

sys.exit(main())
