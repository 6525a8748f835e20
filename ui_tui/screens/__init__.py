"""The dashboard, the partition stepper and the devices prompt."""
