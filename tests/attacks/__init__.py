"""Attack tests: each performs one attack from a security finding against real parts and checks it fails."""
