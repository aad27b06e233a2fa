"""Pure passes over IR programs, one per module; `pipeline` orders them."""
