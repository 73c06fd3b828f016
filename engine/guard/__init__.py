"""The isolation guard: canaries, the read log behind incident scoping, fault switches."""
