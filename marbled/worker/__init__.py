"""The library a training job uses to take part in suspend/resume."""
