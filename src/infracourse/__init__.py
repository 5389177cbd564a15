"""infracourse: an AI-infrastructure course whose labs are graded on the learner's own hardware."""
__version__ = "0.1.0"
