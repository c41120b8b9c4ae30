"""The calculator math agent (after Agent Lightning's Calc-X task): seeded arithmetic word
problems, a safe calculator tool, and the exact-answer reward."""
