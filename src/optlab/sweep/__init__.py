"""`optlab sweep`: capacity under the SLO, the knee, and the levels that show them."""
