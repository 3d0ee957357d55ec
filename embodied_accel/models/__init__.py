"""Model families. Each family folder holds config.py, model.py, weights.py and processor.py."""
