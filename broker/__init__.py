"""The broker service: FastAPI app, SQLModel persistence, the control loop and the CLI."""
