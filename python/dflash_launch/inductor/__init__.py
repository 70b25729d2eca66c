"""What the package does inside torch's compiler: the ISA-probe record (isa_verdict) and the hook that applies it
when torch imports the module it patches (on_import)."""
