"""The core that decides and frees: classify a record, plan its steps, and free them behind the fence."""
