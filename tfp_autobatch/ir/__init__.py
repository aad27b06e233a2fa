"""The two IR levels: IR-1 (`ir1`, functions of blocks) and IR-2 (`ir2`)."""
