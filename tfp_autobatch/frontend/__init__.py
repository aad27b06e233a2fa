"""Python source -> IR-1."""
