
r1mHello2333?fff?((R

REND