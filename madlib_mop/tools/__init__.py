"""Tools that run outside the server: embedded server, extension build, demo, replay, server authentication set-up."""
