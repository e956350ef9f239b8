"""What an operator does with a campaign: list, status and cancel (`dpone ledger`), restate,
verify (`dpone verify`), and which campaign a catalog change starts.
"""
