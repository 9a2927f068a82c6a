"""Where an engine is built and measured: placement, timing, peak memory, compile and quantizer paths per device
kind (base.py has the interface, registry.py the names). Devices sit below the trial (which builds on one) and
the backends (which choose one)."""
