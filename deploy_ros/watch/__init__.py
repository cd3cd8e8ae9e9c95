"""A running node seen from outside its ticks: every tick to an MCAP bag (`recorder`), its reports
followed from another terminal or machine (`monitor`), and the operator's requests sent and their
answers read from there (`remote`)."""
