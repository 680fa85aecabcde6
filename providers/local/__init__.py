"""The local pool: this machine, and any host the operator names over SSH, as an on-prem pool whose jobs run under
the real instance agent (`providers.local.pool`)."""
