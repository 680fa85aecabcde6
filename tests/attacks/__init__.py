"""Attack tests: each performs one attack from a security finding against real parts and must fail on the code
the finding was made against."""
