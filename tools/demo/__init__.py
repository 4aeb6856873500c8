"""The demo (`./dev demo`, `python -m tools.demo`) and the in-process simulation (`python -m tools.demo.simulate`)."""
