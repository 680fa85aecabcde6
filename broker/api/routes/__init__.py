"""One router per resource. Routes validate, authorise, call one service function and return a schema."""
