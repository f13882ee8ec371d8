"""``batchsim calibrate``: fit a hardware profile's terms to a user's own measurements."""
