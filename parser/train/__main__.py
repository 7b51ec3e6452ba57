"""`parser train --config-name train/<preset> ...`: the verl trainer (`parser.train.train`)."""
from parser.train.train import main

if __name__ == "__main__":
    main()
