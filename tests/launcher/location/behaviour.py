"""What the test runs report as their code's version; tests rewrite this file to change the code."""

VERSION = "first"
