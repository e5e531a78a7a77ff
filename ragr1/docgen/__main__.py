from ragr1.docgen import main

main()
